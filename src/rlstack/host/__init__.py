"""The host side: stack files, locks, images, containers, the Docker engine, native staging, CI."""
