"""Apache Beam pipelines that run converters, filters, dedup and export over shards."""
