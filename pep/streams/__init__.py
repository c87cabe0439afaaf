"""The stream catalogue: which streams exist, their schemas and owners, and the owner's ingest."""
