"""Image deduplication on dbworker: ``api`` (FastAPI) and ``worker`` services, ``tasks``."""
