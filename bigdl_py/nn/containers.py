"""containers"""

__all__: list[str] = []
