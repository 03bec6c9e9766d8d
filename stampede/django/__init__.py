"""stampede for Django: a cache backend whose ``get_or_set`` loads once across processes
(``StampedeCache``), and invalidations that wait for the transaction's commit
(``stampede.django.commit``). See docs/frameworks.md."""

from .cache import StampedeCache

__all__ = ["StampedeCache"]
