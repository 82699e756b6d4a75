"""Apache Beam pipelines that run converters, filters, dedup and export over shards."""

import logging


class _DropGcpImportWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()


# Importing Beam logs a warning about optional GCP client libraries through the root logger; it
# is noise for a CLI. Installed here, before any stage imports Beam.
logging.getLogger().addFilter(_DropGcpImportWarning())
