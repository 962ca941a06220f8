"""The webhook's HTTPS server: the ASGI app around ``service.Admitter`` (``server``), the parts of
uvicorn it bounds (``_uvicorn``), the probes' own listener (``health``) and the worker processes
(``workers``). It answers what the service decides and decides nothing itself."""
