"""An HTTP response cache in front of ASGI and WSGI applications: concurrent requests for
one page, in every worker process, make one call of the view (nginx's
``proxy_cache_lock``), and ``stale-while-revalidate`` / ``stale-if-error`` are served as
the response asks (``proxy_cache_use_stale``, Varnish's grace). See docs/frameworks.md."""

from .asgi import CacheMiddleware
from .cache import ResponseCache
from .wsgi import WSGICacheMiddleware

__all__ = ["CacheMiddleware", "ResponseCache", "WSGICacheMiddleware"]
