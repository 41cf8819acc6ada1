"""storage package: the object store (storage/objects.py, local.py, s3.py) and the manifest commit protocol
(storage/manifest.py). It imports neither Dagster nor torch, so both engines and the asset layer share it."""
