# warmstart — two commands do everything (as root, on Debian):
#   make demo   install what is missing, build, show a real cold launch sped up
#   make test   install what is missing, build, run every test
SHELL := /bin/bash
CARGO ?= cargo
# docker-registry, lintian, dpkg-dev and systemd are for the package and
# registry tests (a registry the tests start on a loopback port; on a
# machine booted with systemd, Debian's package also enables its own
# service on :5000: `systemctl disable --now docker-registry` if unwanted);
# strace for the kill-at-every-write test; fuse3, fio and btrfs-progs for
# the storage testbed; xvfb for the bench's window-readiness tests; preload
# for `warmstart bench usage` (which runs it itself: on a machine booted
# with systemd, `systemctl disable --now preload`, or it prefetches behind
# every other benchmark).
DEB_PACKAGES := clang llvm libelf-dev zlib1g-dev pkg-config make e2fsprogs xfsprogs util-linux python3 \
	docker-registry lintian dpkg-dev systemd strace fuse3 fio btrfs-progs xvfb preload
# The guests of tests/guests (Debian's releases booted in QEMU), installed
# without their recommends (QEMU's would bring a desktop's libraries).
GUEST_PACKAGES := qemu-system-x86 qemu-utils mmdebstrap
# The binary users run is linked statically (glibc included): `warmstart
# run` starts before every launch it wraps, and dynamic loading and
# relocation were half its cost on a warm launch (warm `run` overhead
# 2.6 -> 1.4 ms, cold `warmstart --version` 18.0 -> 14.6 ms, 2026-11-23).
# crt-static needs an explicit --target, or it would apply to proc-macros
# too; evaluated when used, after `deps` has installed rustc.
HOST = $(shell rustc -vV | sed -n 's/^host: //p')
RELEASE = target/$(HOST)/release/warmstart
# The full binary the small `warmstart` hands every command but a
# prefetched launch to; installed in ../lib/warmstart/ from it.
RELEASE_CORE = target/$(HOST)/release/warmstart-core
# The benchmark harness, a binary of its own that `warmstart bench` runs:
# installed beside warmstart, so the product binary does not carry it.
RELEASE_BENCH = target/$(HOST)/release/warmstart-bench
# Raw benchmark output: kept in the repository if wanted, never installed.
BENCH_RUN := bench/runs/$(shell date +%F)-$(shell hostname)

.PHONY: all deps build release deb test test-guests clean-guests demo bench lint fmt clean install

all: build

# Installs the Debian packages that are missing (needs root and apt).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if ! command -v $(CARGO) >/dev/null 2>&1; then missing="$$missing cargo rustc"; fi; \
	guests=""; for p in $(GUEST_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || guests="$$guests $$p"; \
	done; \
	if [ -n "$$missing$$guests" ]; then \
	  echo "installing:$$missing$$guests"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (or install:$$missing$$guests)"; exit 1; fi; \
	  apt-get update -qq; \
	  [ -z "$$missing" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  [ -z "$$guests" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$guests >/dev/null; \
	fi

build: deps
	$(CARGO) build --workspace

release: deps
	RUSTFLAGS="$$RUSTFLAGS -C target-feature=+crt-static" $(CARGO) build --release -p warmstart -p warmstart-bench --target $(HOST)

# The Debian package (target/debian/warmstart_VERSION_ARCH.deb) of the
# static release build: dist/debian/ holds its control files and scripts.
DEB_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
deb: release
	dist/debian/build.sh target/$(HOST)/release $(DEB_VERSION) target/debian

test: build
	$(CARGO) test --workspace
	$(MAKE) --no-print-directory test-guests

# warmstart in QEMU guests of Debian's releases, each with its stock kernel
# and systemd: the static binaries everywhere, the package where systemd
# can run it. One release alone: tests/guests/matrix bookworm (see its
# head). Images are cached in /var/cache/warmstart-guests.
DEB_FILE = target/debian/warmstart_$(DEB_VERSION)_$(shell dpkg --print-architecture).deb
test-guests: deb
	tests/guests/matrix
	WS_DEB=$(CURDIR)/$(DEB_FILE) tests/guests/matrix --job package bookworm trixie sid

clean-guests:
	tests/guests/guest clean

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

demo: release
	WS=$(CURDIR)/$(RELEASE) ./scripts/demo.sh

# Raw output goes to bench/runs/DATE-HOST/, never into docs/ (which is
# installed); docs/benchmarks.md embeds the markdown export (bench.md).
bench: release
	mkdir -p $(BENCH_RUN)
	$(RELEASE) bench --suite bench/suite.toml --runs 5 --plot $(BENCH_RUN) \
	  --export-json $(BENCH_RUN)/bench.json --export-csv $(BENCH_RUN)/bench.csv \
	  --export-markdown $(BENCH_RUN)/bench.md
	@echo "tables for docs/benchmarks.md: $(BENCH_RUN)/bench.md"

install: release
	install -m 0755 $(RELEASE) /usr/local/bin/warmstart
	install -d -m 0755 /usr/local/lib/warmstart
	install -m 0755 $(RELEASE_CORE) /usr/local/lib/warmstart/warmstart-core
	install -m 0755 $(RELEASE_BENCH) /usr/local/bin/warmstart-bench
	install -d -m 0755 /etc/warmstart /usr/local/share/doc/warmstart/guide /usr/local/share/doc/warmstart/reference
	[ -e /etc/warmstart/config.toml ] || install -m 0644 dist/config.toml /etc/warmstart/config.toml
	install -m 0644 README.md docs/benchmarks.md docs/benchmarks-usage.md docs/benchmarks-testbeds.md /usr/local/share/doc/warmstart/
	install -d -m 0755 /usr/local/share/doc/warmstart/img
	install -m 0644 docs/img/*.svg /usr/local/share/doc/warmstart/img/
	install -m 0644 docs/guide/*.md /usr/local/share/doc/warmstart/guide/
	install -m 0644 docs/reference/*.md /usr/local/share/doc/warmstart/reference/
	install -d -m 0755 /usr/local/share/doc/warmstart/examples
	install -m 0644 dist/examples/registry.conf /usr/local/share/doc/warmstart/examples/
	if [ -d /etc/systemd/system ]; then \
	  sed 's|/usr/bin/warmstart|/usr/local/bin/warmstart|' dist/warmstart.service > /etc/systemd/system/warmstart.service; \
	  systemctl daemon-reload 2>/dev/null || true; echo "enable with: systemctl enable --now warmstart"; fi

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
