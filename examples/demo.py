"""The README's demo: ``python examples/demo.py`` is ``python -m stampede demo`` (the demo
lives in the package, ``stampede/demo.py``, so that an installed stampede runs it too)."""

from stampede.demo import main

if __name__ == "__main__":
    main()
