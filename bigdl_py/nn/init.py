"""init"""

__all__: list[str] = []
