"""Flask-Caching's generic backend tests (``GenericCacheTests``, every cache type's) over
``StampedeCache``. Copied beside Flask-Caching's own tests, as
``test_stampede_backend.py``, by ``tests/frameworks/test_flask_caching.py``."""

import os
import uuid

import pytest
import test_backend_cache as theirs

from stampede.flask_caching import StampedeCache


class TestStampedeCache(theirs.GenericCacheTests):
    _can_use_fast_sleep = False  # the server's clock decides

    @pytest.fixture
    def make_cache(self):
        cache = StampedeCache(os.environ["STAMPEDE_FLASK_URL"], key_prefix="werkzeug-test-case:",
                              options={"namespace": uuid.uuid4().hex})  # fmt: skip
        yield lambda: cache
        cache.clear()
