"""The user's mistakes as exceptions: every command prints one as one line naming the input and the fix, and
exits 2 (:mod:`ralm.cli`). Their own module so that the lowest modules (documents, settings) share them."""

from __future__ import annotations


class InputError(ValueError):
    """A problem with the user's input. The message names the input and the fix; CLIs print it as one
    line and exit with status 2."""


class SettingsError(InputError):
    """A setting (or a combination of settings) that cannot work."""
