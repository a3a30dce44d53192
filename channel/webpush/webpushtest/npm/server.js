// Runs web-push-testing's push service for the Go tests: its own server and
// model, but listening on 127.0.0.1 at a port the kernel picks (its CLI binds
// every interface at a fixed port, and detaches). It prints {"port": N} once
// it listens, and exits when stdin closes, so it never outlives the test.
'use strict';

const Server = require('web-push-testing/src/server.js');
const {PushApiModel} = require('web-push-testing/src/PushApiModel.js');

const model = new PushApiModel();
const server = new Server(model, 0);
const listener = server._app.listen(0, '127.0.0.1', () => {
	const {port} = listener.address();
	model.notifyUrl = `http://127.0.0.1:${port}/notify/`;
	console.log(JSON.stringify({port}));
});
listener.on('error', err => {
	console.error(err);
	process.exit(1);
});
server.setRequestHandlers();

process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
