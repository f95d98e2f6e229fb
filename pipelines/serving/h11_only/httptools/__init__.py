"""Stands in for the `httptools` package in the processes of a Ray that serves capsules (this folder is first on
their PYTHONPATH: `pipelines.serving.exposure`), so that the Serve proxy's uvicorn parses HTTP with h11.

Why: uvicorn's httptools parser keeps a request's headers however long they grow (two connections of 500 MB of
headers took a proxy from 222 MB to 1,330 MB, before any token is checked), while h11 refuses a request head past
16 KB with 400; Ray Serve passes uvicorn no protocol or header setting, and uvicorn picks httptools whenever it
imports.
"""

raise ImportError("httptools is kept out of this Ray's processes so that Serve's proxy parses HTTP with h11, "
                  "which bounds a request head at 16 KB (pipelines/serving/exposure.py)")
