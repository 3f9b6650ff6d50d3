"""What the two image-deduplication examples share: models, settings, imaging, the API.

``imagededup_dbworker`` and ``imagededup_celery`` differ only in how work is run: this
package is the application itself, so the two can be read side by side.
"""
