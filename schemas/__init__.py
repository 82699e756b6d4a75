"""The interlingua: pydantic models, their JSON Schema and Arrow schema, and the shard store."""
