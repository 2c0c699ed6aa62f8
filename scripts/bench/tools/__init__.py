"""The tools: each one way of loading a checkpoint, prepared before the clock starts.

``base`` holds what they share, ``local`` those that read files on disk, ``remote``
those that fetch them from nginx over HTTP or S3, ``cache`` those of model-cache.
"""
