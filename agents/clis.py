"""The coding agents the harness runs, as a user sets them up against Bubo (docs/agents.md).

Each is installed from the npm registry at a pinned version into the harness's
cache folder (never globally), and run non-interactively, offline, with its
home in a temporary folder: update checks, telemetry and error reports off,
every request sent to the logging proxy on 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import attrs

__all__ = ["AGENTS", "Agent", "install"]


@attrs.frozen(kw_only=True)
class Agent:
    """One CLI: its package, and how to point it at a base URL."""

    name: str
    package: str  # npm name@version
    binary: str  # its command in node_modules/.bin
    model: str  # the model name it is told to use (Bubo runs with --model-names any)

    def command(self, cache: Path, task: str, *, slowed: bool = False) -> list[str]:
        """The command line that runs *task* once, non-interactively.

        *slowed*: the server reads prompts slowly on purpose (agents/run.py ``--slow-prefill``):
        qwen-code then runs one turn with a one-line system prompt and fewer tools (about 11,600
        prompt tokens, not 17,400), so the run lasts minutes, not an hour; the others ignore it.
        """
        program = str(cache / "node_modules" / ".bin" / self.binary)
        match self.name:
            case "claude":
                return [program, "-p", task, "--permission-mode", "acceptEdits", "--max-turns", "4"]
            case "codex":
                return [program, "exec", "--skip-git-repo-check", task]
            case "qwen":
                flags = ["--auth-type", "openai", "--approval-mode", "auto-edit"]
                lean = (
                    ["--max-session-turns", "1", *_QWEN_SHORT_PROMPT]
                    if slowed
                    else ["--max-session-turns", "4"]
                )
                return [program, *flags, *lean, "-p", task]
            case _:
                return [program, "run", "--model", f"bubo/{self.model}", task]

    def environment(self, base_url: str, home: Path, context: int, *, slowed: bool = False) -> dict[str, str]:
        """Its variables: the base URL and model, no traffic but to it (files it reads are written too).

        *slowed* (see :meth:`command`): qwen-code's cap on a stream's whole length is lifted, its idle
        guard kept: the cap (15 minutes) is no idle timeout, and a prompt read slowly on a busy machine
        may outlast it.
        """
        common = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1"}
        match self.name:
            case "claude":
                return {
                    **common,
                    "ANTHROPIC_BASE_URL": base_url,
                    "ANTHROPIC_API_KEY": "sk-local",
                    "ANTHROPIC_MODEL": self.model,
                    "ANTHROPIC_DEFAULT_HAIKU_MODEL": self.model,
                    "ANTHROPIC_DEFAULT_SONNET_MODEL": self.model,
                    "ANTHROPIC_DEFAULT_OPUS_MODEL": self.model,
                    "CLAUDE_CODE_SUBAGENT_MODEL": self.model,
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                    "DISABLE_TELEMETRY": "1",
                    "DISABLE_AUTOUPDATER": "1",
                    "DISABLE_ERROR_REPORTING": "1",
                    "API_TIMEOUT_MS": "1800000",
                }
            case "codex":
                codex_home = home / ".codex"
                codex_home.mkdir(parents=True, exist_ok=True)
                (codex_home / "config.toml").write_text(_codex_config(self.model, base_url, context))
                return {**common, "CODEX_HOME": str(codex_home), "BUBO_API_KEY": "sk-local"}
            case "qwen":
                settings = home / ".qwen" / "settings.json"
                settings.parent.mkdir(parents=True, exist_ok=True)
                settings.write_text(json.dumps(_QWEN_SETTINGS, indent=1))
                # its idle guard keeps its default (QWEN_STREAM_IDLE_TIMEOUT_MS, 240 s): keep-alives feed it
                return {
                    **common,
                    "OPENAI_BASE_URL": f"{base_url}/v1",
                    "OPENAI_API_KEY": "sk-local",
                    "OPENAI_MODEL": self.model,
                    **({"QWEN_STREAM_MAX_LIFETIME_MS": "0"} if slowed else {}),
                }
            case _:
                config = home / "opencode.json"
                config.write_text(json.dumps(_opencode_config(self.model, base_url, context), indent=1))
                return {
                    **common,
                    "OPENCODE_CONFIG": str(config),
                    "OPENCODE_DISABLE_AUTOUPDATE": "1",
                    "OPENCODE_DISABLE_MODELS_FETCH": "1",
                    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
                    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                }


def _codex_config(model: str, base_url: str, context: int) -> str:
    """Codex's config.toml: the Bubo provider (Responses API), no update check, analytics or telemetry."""
    return f"""model = "{model}"
model_provider = "bubo"
model_context_window = {context}
check_for_update_on_startup = false
approval_policy = "never"
sandbox_mode = "workspace-write"

[model_providers.bubo]
name = "Bubo"
base_url = "{base_url}/v1"
env_key = "BUBO_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"""


_QWEN_SETTINGS = {
    "general": {"enableAutoUpdate": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "security": {"auth": {"selectedType": "openai"}},
}
"""qwen-code's ~/.qwen/settings.json: the OpenAI API, no update check, usage statistics or telemetry."""


_QWEN_SHORT_PROMPT = (
    "--system-prompt", "You are a coding agent. Use the tools to read and edit files.",
    "--exclude-tools", "agent", "skill", "tool_search", "tool_call", "list_agents", "get_goal", "update_goal",
)  # fmt: skip


def _opencode_config(model: str, base_url: str, context: int) -> dict[str, object]:
    """The opencode config: Bubo as an OpenAI-compatible provider, no updates or sharing."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"bubo/{model}",
        "provider": {
            "bubo": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Bubo",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": "sk-local"},
                "models": {model: {"name": model, "limit": {"context": context, "output": 4096}}},
            }
        },
    }


AGENTS = (
    Agent(name="claude", package="@anthropic-ai/claude-code@2.1.328", binary="claude", model="qwen2.5-coder"),
    # a model family Codex knows: its tools come in an additional_tools item, custom tools among them
    Agent(name="codex", package="@openai/codex@0.169.0", binary="codex", model="gpt-6.1-sol"),
    Agent(name="opencode", package="opencode-ai@1.18.33", binary="opencode", model="qwen2.5-coder"),
    # OpenAI chat through the openai JS SDK; ~17,400 prompt tokens before the task (issue 39)
    Agent(name="qwen", package="@qwen-code/qwen-code@0.24.4", binary="qwen", model="qwen2.5-coder"),
)


def install(agents: tuple[Agent, ...], cache: Path) -> None:
    """``npm install`` the agents' packages into *cache* unless their commands are there already."""
    missing = [
        agent.package for agent in agents if not (cache / "node_modules" / ".bin" / agent.binary).exists()
    ]
    if not missing:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm is needed to install the coding agents (Debian: apt-get install npm)")
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund", "--no-save", *missing],
        check=True,
        timeout=900,
    )
