# warmstart — two commands do everything (as root, on Debian):
#   make demo   install what is missing, build, show a real cold launch sped up
#   make test   install what is missing, build, run every test
SHELL := /bin/bash
CARGO ?= cargo
DEB_PACKAGES := clang llvm libelf-dev zlib1g-dev pkg-config make e2fsprogs xfsprogs util-linux python3
RELEASE := target/release/warmstart

.PHONY: all deps build release test demo bench lint fmt clean install

all: build

# Installs the Debian packages that are missing (needs root and apt).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if ! command -v $(CARGO) >/dev/null 2>&1; then missing="$$missing cargo rustc"; fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (or install:$$missing)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

build: deps
	$(CARGO) build --workspace

release: deps
	$(CARGO) build --release --workspace

test: build
	$(CARGO) test --workspace

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

demo: release
	./scripts/demo.sh

bench: release
	./target/release/warmstart bench --suite bench/suite.toml --runs 5 --plot docs/img --export-json docs/img/bench.json --export-csv docs/img/bench.csv

install: release
	install -m 0755 $(RELEASE) /usr/local/bin/warmstart
	install -d -m 0755 /etc/warmstart /usr/local/share/doc/warmstart
	[ -e /etc/warmstart/config.toml ] || install -m 0644 dist/config.toml /etc/warmstart/config.toml
	install -m 0644 docs/*.md /usr/local/share/doc/warmstart/
	if [ -d /etc/systemd/system ]; then install -m 0644 dist/warmstart.service /etc/systemd/system/; \
	  systemctl daemon-reload 2>/dev/null || true; echo "enable with: systemctl enable --now warmstart"; fi

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
