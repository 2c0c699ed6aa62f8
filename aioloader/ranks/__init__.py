"""Who reads what: ``strategy.py`` (the ``Ranks`` strategy: ``Solo`` reads every read),
``group.py`` (a ``group=`` load: a share each), ``exchange.py`` (the ranks' gloo exchange
of the rest) and ``agreement.py`` (what the ranks compare before reading)."""
