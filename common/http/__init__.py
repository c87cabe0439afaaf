"""The HTTP edge every side shares (Flask only here): who is calling (`auth`), the one JSON
error body and the shared kinds' statuses (`errors`), bounded JSON request bodies
(`safe_json`)."""
