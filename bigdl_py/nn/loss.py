"""loss"""

__all__: list[str] = []
