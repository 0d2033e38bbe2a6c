# Two commands set everything up on a fresh machine: `make up` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up test install install-dev clients sim bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Editable installs: a .pth file puts the checkout on sys.path (pyproject.toml's package-dir), so
# type checkers find the packages and client/py.typed.
install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-dev: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'

# RocketMQ 4.x applications in the tests (tests/remoting): the C++ client's Python wrapper, in a
# virtual environment of its own (it installs the top-level module `rocketmq`, as the RocketMQ 5
# client of the main one does). 2.0.0 on PyPI lacks the native library: the pin is exact.
CLIENTS := .venv-clients
$(CLIENTS)/rmq4/bin/python:
	$(PY) -m venv $(CLIENTS)/rmq4
	$(CLIENTS)/rmq4/bin/pip install -q rocketmq-client-python==0.5.0rc2

# ... the same C++ family's older wrapper, which sends batches (PyPI rocketmq 0.4.4) ...
$(CLIENTS)/rmq4-batch/bin/python:
	$(PY) -m venv $(CLIENTS)/rmq4-batch
	$(CLIENTS)/rmq4-batch/bin/pip install -q rocketmq==0.4.4

# ... and ali-ons, a 4.x client in pure JavaScript (Node 20), in an npm folder of its own.
$(CLIENTS)/ali-ons/node_modules/ali-ons/package.json:
	mkdir -p $(CLIENTS)/ali-ons
	cd $(CLIENTS)/ali-ons && npm install --silent --no-audit --no-fund ali-ons@3.12.0

# The official RocketMQ 5 Node.js client (gRPC; tests/frontends/test_grpc_node.py), likewise.
$(CLIENTS)/rmq5-node/node_modules/rocketmq-client-nodejs/package.json:
	mkdir -p $(CLIENTS)/rmq5-node
	cd $(CLIENTS)/rmq5-node && npm install --silent --no-audit --no-fund rocketmq-client-nodejs@1.0.8

clients: $(CLIENTS)/rmq4/bin/python $(CLIENTS)/rmq4-batch/bin/python \
	$(CLIENTS)/ali-ons/node_modules/ali-ons/package.json \
	$(CLIENTS)/rmq5-node/node_modules/rocketmq-client-nodejs/package.json

# Start a NameServer and a 3-node broker group in the foreground (Ctrl-C stops them).
up: install
	$(BIN)/dledger up

# The whole test suite, including the simulator sweep (time-boxed) and canaries, on
# PYTEST_WORKERS processes (pytest-xdist: a module's tests on one worker, each live chaos run on
# its own; tests/conftest.py), the 25 slowest printed at the end.
PYTEST_WORKERS ?= 4
test: install-dev clients
	$(BIN)/ruff check protocol bench dledger broker namesrv client chaos cli tests examples
	$(BIN)/mypy --strict client protocol
	$(BIN)/mypy dledger broker namesrv chaos cli bench examples
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --durations=25

sim: install-dev
	$(BIN)/python -m chaos.sim --seeds 0-999 --nodes 3,5

bench: install-dev
	$(BIN)/python -m bench.log

clean:
	rm -rf $(VENV) $(CLIENTS) build *.egg-info
