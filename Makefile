# spoolcast — make targets. `make run` starts the pipeline locally; `make test` is what CI runs.
GO        ?= go
FUZZTIME  ?= 30s
BIN       ?= bin/spoolcast

.PHONY: run build test lint check-deploy check-tour chaos chaos-selfcheck bench fuzz inbox clean

## run: the whole pipeline locally (Postgres under ./data/pg, migrations, relay + forwarder); Ctrl-C stops it
## (installs PostgreSQL with apt-get when missing, unless DATABASE_URL names one)
run: build
	@[ -n "$$DATABASE_URL" ] || scripts/ensure-deps postgresql
	./$(BIN) dev

## build: build the spoolcast binary into bin/, stamped with the git version and commit
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)
build:
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION) -X main.buildCommit=$(COMMIT)" -o $(BIN) ./cmd/spoolcast

## test: vet, then every test with the race detector, the JavaScript SDK's included (Node.js 20+ and npm; installs PostgreSQL, PgBouncer
## and Chromium with apt-get when missing)
test:
	@[ -n "$$DATABASE_URL" ] || scripts/ensure-deps postgresql pgbouncer
	@scripts/ensure-deps chromium
	$(GO) vet ./...
	$(GO) run ./internal/testreport -race -count=1 ./...

## check-deploy: what CI proves of deploy/: the alert rules pass promtool's check and unit tests, every
## kustomization under deploy/kubernetes renders and validates, the Dockerfile's build stage builds and runs
## (installs promtool with apt-get when missing)
check-deploy:
	@scripts/ensure-deps prometheus
	promtool check rules deploy/prometheus/rules.yaml
	promtool test rules deploy/prometheus/rules_test.yaml
	cd deploy/check && $(GO) vet ./... && $(GO) test -count=1 ./...
	scripts/check-dockerfile

## check-tour: run the README's five-minute tour verbatim against a fresh dev stack (ports 7070 and 8080)
check-tour:
	@[ -n "$$DATABASE_URL" ] || scripts/ensure-deps postgresql
	scripts/check-readme-tour

## chaos: the whole system (Postgres primary + synchronous standby, two relays, two central replicas, fake Expo, APNs, FCM and
## Web Push service, a webhook receiver,
## apps on sockets) under every production fault for CHAOS_DURATION (default 10m), then one row per invariant;
## non-zero on any violation. CHAOS_SEED replays a run. Needs root (tmpfs spool volumes); installs PostgreSQL
CHAOS_DURATION ?= 10m
CHAOS_SEED     ?= 0
# CHAOS_SCHEDULED=false leaves scheduled events out of the traffic.
CHAOS_SCHEDULED ?= true
chaos: build
	@[ -n "$$DATABASE_URL" ] || scripts/ensure-deps postgresql
	CHAOS_DURATION=$(CHAOS_DURATION) CHAOS_SEED=$(CHAOS_SEED) $(GO) run ./benchmarks/chaos -spoolcast $(BIN) -scheduled=$(CHAOS_SCHEDULED)

## chaos-selfcheck: 60 s of chaos traffic without faults against a binary built with -tags chaosdefects, which
## acknowledges 1 in 1,000 events without storing them, sends 1 in 1,000 pushes twice and drops 1 in 1,000 live
## frames, and takes every device's refusal for the deployment's; then a duplicate and a stuck dispatch planted in
## Postgres. It must report all six and fail, or the
## checks cannot fail
SELFCHECK_BIN ?= bin/spoolcast-chaosdefects
chaos-selfcheck:
	@[ -n "$$DATABASE_URL" ] || scripts/ensure-deps postgresql
	$(GO) build -tags chaosdefects -o $(SELFCHECK_BIN) ./cmd/spoolcast
	@out=$$(mktemp); status=0; \
	CHAOS_DURATION=60s CHAOS_SEED=$(CHAOS_SEED) $(GO) run ./benchmarks/chaos -spoolcast $(SELFCHECK_BIN) -selfcheck -faults=false >$$out 2>&1 || status=$$?; cat $$out; \
	for row in "every event answered 2xx is stored for each recipient" "each device got each push at most once" "every app saw every notification of its user" \
	           "no notification is stored twice" "every notification's push ended" "a device's refusal disabled that device alone"; do \
		grep -q "^| $$row.* | \*\*NO\*\* |" $$out || { echo "chaos-selfcheck: the planted violation of \"$$row\" was not reported"; exit 1; }; \
	done; \
	[ $$status -eq 1 ] || { echo "chaos-selfcheck: exit status $$status, want 1"; exit 1; }; \
	echo "chaos-selfcheck: all six planted violations were reported, and the run failed, as it must"

## lint: go vet and gofmt must both be clean
lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

## bench: hot-path benchmarks, the relay load generator, the forwarder, feed-depth, feed-load (wrk), push and live stream benchmarks,
## the whole pipeline end to end (producer POST to the app's frame and to the push request), topics (membership and a 1M-member fan-out), the APNs and FCM
## channels against bare loops, then the relay against Redis, NATS JetStream and Postgres (benchmarks/peers, a module of its own) with its plot
bench:
	@scripts/ensure-deps postgresql redis wrk
	$(GO) test -run '^$$' -bench . -benchtime 2s ./spool/ ./relay/
	$(GO) run ./benchmarks/loadgen -duration 10s
	$(GO) run ./benchmarks/forwardbench
	$(GO) run ./benchmarks/feedbench
	$(GO) run ./benchmarks/feedload
	$(GO) run ./benchmarks/pushbench
	$(GO) run ./benchmarks/livebench
	$(GO) run ./benchmarks/e2e -duration 10s
	$(GO) run ./benchmarks/topicbench -members 1000000
	$(GO) run ./benchmarks/fanout -members 1000000
	$(GO) run ./benchmarks/channelbench
	cd benchmarks/peers && $(GO) run . -plot

## inbox: rebuild inbox/static/inbox.js, the web inbox's committed script, from inbox/src/inbox.ts and the SDK's
## client (Node.js 20+ and npm); commit the result: go test ./inbox/ fails while it differs
inbox:
	cd sdk/js && npm ci --no-audit --no-fund && npm run inbox

## fuzz: run each fuzz target for FUZZTIME
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./event/
	$(GO) test -run '^$$' -fuzz FuzzDecodeCursor -fuzztime $(FUZZTIME) ./feed/
	$(GO) test -run '^$$' -fuzz FuzzParseCursor -fuzztime $(FUZZTIME) ./live/
	$(GO) test -run '^$$' -fuzz FuzzWebSocketToken -fuzztime $(FUZZTIME) ./auth/

clean:
	rm -rf bin data
