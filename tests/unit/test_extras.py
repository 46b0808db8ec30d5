"""A missing optional extra is one clear line naming the extra, not a bare import error."""

import pytest

from engine.extras import MissingExtra, require


def test_an_installed_module_is_returned():
    assert require("json", "none", "a test").dumps([1]) == "[1]"


def test_a_missing_module_names_the_extra_and_the_command():
    with pytest.raises(
        MissingExtra,
        match=r"the report needs the `report` extra: "
        r"pip install 'eslab\[report\]' \(no_such_mod",
    ):
        require("no_such_module_for_eslab", "report", "the report")


def test_missing_extra_is_an_import_error():
    assert issubclass(MissingExtra, ImportError)
