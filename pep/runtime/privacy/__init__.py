"""What a consumer may see of a value, in Spark: masks as column expressions, the stream owners'
hash keys, security labels and their comparisons. Imports no other room of the runtime."""
