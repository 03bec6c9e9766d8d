"""The example site as WSGI (gunicorn) and ASGI (uvicorn) applications."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
asgi_application = get_asgi_application()
