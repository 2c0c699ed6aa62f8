"""The safetensors file format, pure: the header and its validation (``safetensors.py``),
the dtype table (``dtypes.py``), and how long a name may be to become a file
(``names.py``). Nothing here does I/O or imports another room but ``errors``."""
