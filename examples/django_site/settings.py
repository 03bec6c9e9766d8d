"""Settings of the example Django site (examples/django_site): every cache use goes
through stampede's backend, at the Redis server ``STAMPEDE_URL`` names."""

import os

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "urls"
INSTALLED_APPS = ["django.contrib.sessions"]
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware"]
DATABASES: dict[str, dict[str, str]] = {}  # sessions live in the cache: no database
SESSION_ENGINE = "django.contrib.sessions.backends.cache"
USE_TZ = True
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [os.path.join(os.path.dirname(__file__), "templates")],
        "OPTIONS": {"builtins": ["django.templatetags.cache"]},
    }
]
CACHES = {
    "default": {
        "BACKEND": "stampede.django.StampedeCache",
        "LOCATION": os.environ["STAMPEDE_URL"],
        "OPTIONS": {"namespace": "site"},
        "TIMEOUT": 300,
    }
}
if os.environ.get("SITE_CACHE") == "django-redis":  # the peer loadtest/bench_http.py compares
    CACHES["default"] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": os.environ["STAMPEDE_URL"]}
