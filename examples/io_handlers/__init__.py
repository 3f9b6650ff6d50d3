"""I/O-bound handlers, typed: ``async def`` on the asyncio executor, ``def`` on threads."""
