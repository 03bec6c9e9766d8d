"""The example site's pages. Each view counts its work on the Redis server
(``INCR site:calls:<name>``), so the count holds whichever worker process served it."""

import json
import os
import time

import redis
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.cache import cache_page

counter = redis.Redis.from_url(os.environ["STAMPEDE_URL"], socket_timeout=5)
HOLD = float(os.environ.get("SITE_HOLD", "0.2"))


def work(name: str) -> int:
    """A piece of work a page does (a query, a rendering): counted, and ``HOLD`` long."""
    number = int(counter.incr(f"site:calls:{name}"))
    time.sleep(HOLD)
    return number


def report(request: HttpRequest) -> HttpResponse:
    """``cache.get_or_set``: a cold key's concurrent requests, in every worker, run the
    report once."""
    value = cache.get_or_set("report", lambda: {"rendered_by_call": work("report")}, timeout=60)
    return JsonResponse(value)


@cache_page(60)
def cached_page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"cached page, call {work('cached_page')}")


def fragment(request: HttpRequest) -> HttpResponse:
    """A page whose sidebar is a cached template fragment ({% cache %})."""
    return render(request, "fragment.html", {"sidebar": lambda: work("sidebar")})


def visits(request: HttpRequest) -> HttpResponse:
    """A session counter: the session lives in the cache (SESSION_ENGINE)."""
    request.session["visits"] = request.session.get("visits", 0) + 1
    return HttpResponse(json.dumps({"visits": request.session["visits"]}), content_type="application/json")


def calls(request: HttpRequest) -> HttpResponse:
    found = {key.decode().removeprefix("site:calls:"): int(counter.get(key) or 0)
             for key in counter.scan_iter("site:calls:*")}  # fmt: skip
    return JsonResponse(found)


urlpatterns = [
    path("report", report),
    path("cached-page", cached_page),
    path("fragment", fragment),
    path("visits", visits),
    path("calls", calls),
]
