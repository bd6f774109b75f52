# The README's two commands.
#
#   make demo   installs the missing build prerequisites (scripts/prereqs:
#               cmake, nasm, a C compiler), then builds and runs `iris demo`
#   make test   runs the whole CI suite (.ci/run), which installs what the
#               suite needs first
#
# Extra arguments for the demo: make demo ARGS='--port 8080'.

CARGO ?= cargo
ARGS ?=

.PHONY: demo test prereqs

demo: prereqs
	$(CARGO) run --release --bin iris -- demo $(ARGS)

prereqs:
	scripts/prereqs

test:
	bash .ci/run
