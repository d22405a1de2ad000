"""recurrent"""

__all__: list[str] = []
