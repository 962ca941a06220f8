"""The mark on the help of commands that run inside images: ``serve --help`` (what ``docker run
IMAGE --help`` shows) lists the commands that carry it. Its own module, so that each area that
registers such a command can use it without importing another area."""

IN_IMAGE = "(inside the image) "
