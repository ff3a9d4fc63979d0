"""Shell completion scripts for an argparse command with subcommands (``ferryctl completion bash|zsh``).

The script is generated from the parser itself, so it never drifts from the
commands: the top-level options, the subcommands with their help, each
subcommand's options and the choices of its positionals (``completion``
completes ``bash zsh``). Options that take a value make the word after them
skipped when the script looks for the subcommand. No dependency beyond the
standard library; it reads argparse's private attributes, which have been
stable since Python 3.2.

Install: ``source <(ferryctl completion bash)`` in ``~/.bashrc``, or
``ferryctl completion zsh > "${fpath[1]}/_ferryctl"`` for zsh.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One subcommand as completion sees it: its name, help, options and positional choices."""

    name: str
    help: str
    options: tuple[str, ...]
    choices: tuple[str, ...]


def _options(parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """(every option string, those that take a value)."""
    every, valued = [], []
    for action in parser._actions:
        for option in action.option_strings:
            every.append(option)
            if action.nargs != 0:
                valued.append(option)
    return every, valued


def describe(parser: argparse.ArgumentParser) -> tuple[list[str], list[str], list[Command]]:
    """Top-level options, those of them that take a value, and the subcommands."""
    top, valued = _options(parser)
    commands = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            options, sub_valued = _options(sub)
            valued.extend(o for o in sub_valued if o not in valued)
            choices = [str(c) for a in sub._actions if not a.option_strings and a.choices for c in a.choices]
            commands.append(Command(name, helps.get(name, ""), tuple(options), tuple(choices)))
    return top, valued, commands


def bash(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    fn = "_" + prog.replace("-", "_")
    top, valued, commands = describe(parser)
    cases = "\n".join(
        f"        {c.name}) words={shlex.quote(' '.join((*c.options, *c.choices)))} ;;" for c in commands)
    return f"""# {prog} completion for bash: source <({prog} completion bash)
{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="" i skip=0 words
    local valued=" {' '.join(valued)} "
    for ((i = 1; i < COMP_CWORD; i++)); do
        local w="${{COMP_WORDS[i]}}"
        if ((skip)); then skip=0; continue; fi
        case "$w" in
            -*) [[ "$valued" == *" $w "* ]] && skip=1 ;;
            *) cmd="$w"; break ;;
        esac
    done
    case "$cmd" in
        "") words={shlex.quote(' '.join((*(c.name for c in commands), *top)))} ;;
{cases}
        *) words="" ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -F {fn} {prog}
"""


def zsh(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    fn = "_" + prog.replace("-", "_")
    top, valued, commands = describe(parser)
    described = "\n".join(f"    {shlex.quote(c.name + ':' + c.help.replace(':', ' '))}" for c in commands)
    cases = "\n".join(
        f"    {c.name}) compadd -- {' '.join(shlex.quote(w) for w in (*c.options, *c.choices))} ;;" for c in commands)
    return f"""#compdef {prog}
# {prog} completion for zsh: {prog} completion zsh > "${{fpath[1]}}/_{prog}"
{fn}() {{
  local -a commands
  commands=(
{described}
  )
  local cmd="" i skip=0
  local -a valued
  valued=({' '.join(valued)})
  for ((i = 2; i < CURRENT; i++)); do
    if ((skip)); then skip=0; continue; fi
    case "${{words[i]}}" in
      -*) (( ${{valued[(Ie)${{words[i]}}]}} )) && skip=1 ;;
      *) cmd="${{words[i]}}"; break ;;
    esac
  done
  if [[ -z "$cmd" ]]; then
    _describe 'command' commands
    compadd -- {' '.join(top)}
    return
  fi
  case "$cmd" in
{cases}
  esac
}}
compdef {fn} {prog}
"""


SHELLS = {"bash": bash, "zsh": zsh}
