"""`chat`: the REPL around generation.chat.ChatSession: read a line, stream the reply, print the figures."""
from __future__ import annotations

import sys

import click

from ..errors import MinigenError
from ..generation.options import summary
from . import harness
from .harness import Command, load_timed, model_option
from .run import pop_constraint, print_end, run_options

CHAT_HELP = """commands:
  /help          this list
  /reset         start a new conversation (the system message is kept)
  /system TEXT   set the system message (/system alone removes it); the conversation is kept
  /save FILE     write the conversation as JSON messages (minigen chat --load FILE resumes it)
  /exit          quit (so does Ctrl-D); Ctrl-C stops a reply and keeps what was printed
a message that starts with / is sent by typing // for its /"""


@click.command(cls=Command)
@model_option
@click.option("--system", help="System message (replaces the one of --load).")
@click.option("--load", "load_path", type=click.Path(exists=True, dir_okay=False),
              help="Resume a conversation saved with /save (a JSON list of messages).")
@run_options("chat")
def chat(model_path, system, load_path, quiet, verbose, **options):
    """A conversation through the checkpoint's chat template, one message per line.

    Each reply is streamed to stdout and followed by a newline; figures go to stderr. The KV cache
    carries over between turns, so a turn computes only its new tokens. In a terminal: line editing
    and history, Ctrl-C stops a reply, Ctrl-D or /exit quits, /help lists the commands. When the
    conversation outgrows the context, its oldest exchanges are dropped (the system message is kept).
    """
    from ..generation.chat import ChatSession, load_conversation
    pop_constraint(options)
    messages = load_conversation(load_path) if load_path else []
    loaded = load_timed(model_path, renders=True)
    model = loaded.model
    session = ChatSession(model, loaded.tokenizer, messages, system=system, **options)
    terminal = harness.stdin_is_terminal()
    if terminal:
        enable_line_editing()
        click.echo(f"minigen chat: {model.path}; /help for commands, Ctrl-D or /exit to quit", err=True)
    if verbose:
        click.echo(f"model: {model.path} ({model.config.model_type}), {summary(session.options)}", err=True)
    failed = False
    try:
        for line in read_lines(terminal):
            line = line.strip()
            try:
                if line.startswith("/") and not line.startswith("//"):
                    if not chat_command(session, line):
                        break
                elif line:
                    print_reply(session.reply(line[1:] if line.startswith("//") else line), loaded.seconds, quiet,
                                verbose)
            except MinigenError as e:  # a bad message or command: say so and go on
                click.echo(f"minigen: error: {e}", err=True)
                failed = True
    except KeyboardInterrupt:  # outside a reply (reading a pipe): stop there
        sys.exit(130)
    sys.exit(1 if failed else 0)


def enable_line_editing():
    try:
        import readline  # noqa: F401 -- once imported, input() edits lines and keeps a history
    except ImportError:
        pass


def read_lines(terminal: bool):
    """The user's lines: stdin as it comes, or input() with a prompt in a terminal, where Ctrl-C
    abandons the line being typed and Ctrl-D ends. The prompt goes to stderr when stdout is not a
    terminal (`minigen chat | tee log`), which then holds the replies only."""
    if not terminal:
        yield from sys.stdin
        return
    aside = not harness.stdout_is_terminal()
    while True:
        try:
            if aside:
                click.echo(">>> ", nl=False, err=True)
            yield input("" if aside else ">>> ")
        except KeyboardInterrupt:
            click.echo(err=aside)
        except EOFError:
            click.echo(err=aside)
            return


def chat_command(session, line: str) -> bool:
    """Carry out one /command; False when it asks to quit."""
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit", "/bye"):
        return False
    if name == "/help":
        click.echo(CHAT_HELP, err=True)
    elif name == "/reset":
        session.reset()
        click.echo("new conversation" + (" (the system message is kept)" if session.messages else ""), err=True)
    elif name == "/system":
        session.set_system(arg or None)
        click.echo("system message " + ("set" if arg else "removed"), err=True)
    elif name == "/save":
        if not arg:
            raise MinigenError("/save needs a file: /save FILE")
        session.save(arg)
        click.echo(f"saved {len(session.messages)} messages to {arg}", err=True)
    else:
        raise MinigenError(f"unknown command {name} (/help lists them)")
    return True


def print_reply(reply, load_seconds: float, quiet: bool, verbose: bool):
    """Stream one reply to stdout and end it with a newline; notes and figures to stderr."""
    if reply.dropped:
        click.echo(f"minigen: note: the context is full: dropped the oldest {reply.dropped} exchange(s) "
                   f"of the conversation (the system message is kept)", err=True)
    try:
        for piece in reply.pieces():
            click.echo(piece, nl=False)
    except KeyboardInterrupt:
        pass  # the reply stops; what was printed stays in the conversation
    reply.close()
    click.echo()
    print_end(reply.stats, reply.run.options.max_context, "the reply stopped", load_seconds, quiet, verbose)
