"""Changes of a group's membership asked of its leader (add a learner, promote it, remove a
member)."""

__all__: list[str] = []
