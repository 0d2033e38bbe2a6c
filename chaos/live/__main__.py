"""``python -m chaos.live run ...``: the same command as ``dledger chaos run``."""

from chaos.live.command import chaos

if __name__ == "__main__":
    chaos()
