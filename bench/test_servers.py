"""How the benchmark tells which flags a server has: a feature is used only where ``--help`` lists it."""

from __future__ import annotations

import servers

HELP = """\
  --cache-dir PATH      where Bubo keeps its own caches [BUBO_CACHE_DIR]
  -cram MIB, --cache-ram MIB
                        MiB of host RAM for prompt-cache snapshots
"""


class TestListsFlag:
    def test_a_listed_flag(self) -> None:
        assert servers.lists_flag(HELP, "--cache-dir")
        assert servers.lists_flag(HELP, "--cache-ram")

    def test_a_flag_that_is_not_listed(self) -> None:
        """Today's --cache-dir holds Bubo's own caches; the disk prompt cache adds --cache-disk-mib."""
        assert not servers.lists_flag(HELP, "--cache-disk-mib")

    def test_a_longer_flag_does_not_list_its_prefix(self) -> None:
        assert not servers.lists_flag("  --cache-disk-mib MIB  budget", "--cache-disk")
        assert not servers.lists_flag("  --no-cache-dir", "--cache-dir")

    def test_a_flag_in_the_usage_line_counts(self) -> None:
        assert servers.lists_flag("usage: bubo serve [--cache-disk-mib MIB] [-n N]", "--cache-disk-mib")
