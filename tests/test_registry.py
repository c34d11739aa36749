"""common.registry.Registry: register, look up, list and unregister by name."""

import pytest

from common.registry import Registry


def test_register_get_and_unregister():
    things: Registry[int] = Registry("thing")
    things.register("one")(1)
    assert things.get("one") == 1 and "one" in things and things.names() == ["one"]
    with pytest.raises(ValueError, match="registered twice"):
        things.register("one")(2)
    things.unregister("one")
    assert "one" not in things and things.names() == []
    with pytest.raises(KeyError, match="unknown thing 'one'"):
        things.unregister("one")
    things.register("one")(3)  # the name is free again
    assert things.get("one") == 3
