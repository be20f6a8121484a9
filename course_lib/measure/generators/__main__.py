"""``python -m course_lib.measure.generators --port P [ServerConfig flags]``: the null server."""

from course_lib.measure.generators._null import main

if __name__ == "__main__":
    main()
