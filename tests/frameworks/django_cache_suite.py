"""Django's own cache backend tests (``BaseCacheTests``, from the ``tests/cache`` of
Django's source distribution) over ``StampedeCache``, the way Django runs them over its
Redis backend: this module is copied into that ``cache`` test package and run by Django's
``runtests.py`` (``tests/frameworks/test_django_backend.py`` does both).

The cull tests skip, as they do for Django's Redis backend: the ``cull`` and ``zero_cull``
caches are left out (``redis_excluded_caches``), because a server-side cache evicts by
its own policy, not MAX_ENTRIES. No other test is skipped.
"""

import os

from django.test import TestCase, override_settings

from .tests import BaseCacheTests, caches_setting_for_tests, redis_excluded_caches

STAMPEDE_PARAMS = {
    "BACKEND": "stampede.django.StampedeCache",
    "LOCATION": os.environ["STAMPEDE_DJANGO_LOCATION"],
    "OPTIONS": {"namespace": "django-suite"},
}


@override_settings(CACHES=caches_setting_for_tests(base=STAMPEDE_PARAMS, exclude=redis_excluded_caches))
class StampedeCacheTests(BaseCacheTests, TestCase):
    pass
