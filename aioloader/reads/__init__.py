"""Read planning and staging, pure and synchronous: byte-range reads from headers
(``plan.py``), sets of byte ranges (``ranges.py``), a tensor's rows (``rows.py``), the
staging byte budget (``staging.py``), whether a load's tensors can have memory at all
(``room.py``), and whether a read's buffer keeps its bytes (``kept.py``)."""
