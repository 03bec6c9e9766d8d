# Appended to Flask-Caching's own tests/conftest.py (from its source distribution), after
# the fixtures this adaptor keeps (the hash methods): its decorator tests run over a
# stampede.flask_caching.Cache whose type is StampedeCache on STAMPEDE_FLASK_URL, each
# test in a namespace of its own. Its server fixtures (a Redis on its fixed port 6360, a
# memcached) are its other backends' tests: skipped.
import os
import time
import uuid

import flask
import pytest

from stampede.flask_caching import Cache as _StampedeCachingCache


@pytest.fixture
def app(request):
    app = flask.Flask(request.module.__name__, template_folder=os.path.dirname(__file__))
    app.testing = True
    app.config["CACHE_TYPE"] = "stampede.flask_caching.StampedeCache"
    app.config["CACHE_STAMPEDE_URL"] = os.environ["STAMPEDE_FLASK_URL"]
    app.config["CACHE_STAMPEDE_OPTIONS"] = {"namespace": uuid.uuid4().hex}
    return app


@pytest.fixture
def cache(app):
    return _StampedeCachingCache(app)


@pytest.fixture(scope="class")
def redis_server():
    pytest.skip("Flask-Caching's own Redis on its fixed port 6360: its RedisCache's tests, not this type's")


@pytest.fixture(scope="class")
def memcache_server():
    pytest.skip("Flask-Caching's own memcached: its MemcachedCache's tests, not this type's")


class _Waited:
    """The server's clock decides an entry's life: advancing it is waiting."""

    def __call__(self):
        return time.time()

    def advance(self, seconds):
        time.sleep(seconds)


@pytest.fixture
def clock():
    return _Waited()
