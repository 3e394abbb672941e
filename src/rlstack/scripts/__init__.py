"""Code that runs where rlstack is not installed, with nothing but the standard library: by path inside
`docker build` before rlstack is in the image (`image_checks`), or with PYTHONPATH=src on a bare GPU host before
any package is (`native_install`). Nothing here imports a third-party package, and `image_checks` imports nothing
of rlstack at all (tests/test_layout.py runs both without site-packages)."""
