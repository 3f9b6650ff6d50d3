"""Image deduplication on Redis + Celery: the same ``api`` and models, Celery ``tasks``."""
