// Accepts cleartext HTTP/2 with prior knowledge (what the AWS Java SDK's async Kinesis client speaks to an http://
// endpoint) and forwards each request as HTTP/1.1 to a Kinesis emulator that only speaks HTTP/1.1 (kinesalite).
// Usage (after the loopback prelude of kinesalite.py): TARGET_PORT and LISTEN_PORT are set by the launcher.
const http = require('http');
const http2 = require('http2');

// Connection-level headers exist in HTTP/1.1 only; HTTP/2 forbids them in a response.
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade']);
const agent = new http.Agent({keepAlive: true, maxSockets: 64});

function forward(stream, headers) {
  const outgoing = {};
  for (const [name, value] of Object.entries(headers)) {
    if (!name.startsWith(':')) outgoing[name] = value;
  }
  outgoing.host = headers[':authority'] || `127.0.0.1:${TARGET_PORT}`;
  const request = http.request({host: '127.0.0.1', port: TARGET_PORT, method: headers[':method'],
                                path: headers[':path'], headers: outgoing, agent}, (response) => {
    const answer = {':status': response.statusCode};
    for (const [name, value] of Object.entries(response.headers)) {
      if (!HOP_BY_HOP.has(name)) answer[name] = value;
    }
    if (stream.destroyed) { response.resume(); return; }
    stream.respond(answer);
    response.pipe(stream);
  });
  request.on('error', (error) => {
    if (stream.destroyed) return;
    if (!stream.headersSent) stream.respond({':status': 502, 'content-type': 'text/plain'});
    stream.end(`h2c proxy: ${error.message}`);
  });
  stream.on('error', () => request.destroy());
  stream.pipe(request);
}

const server = http2.createServer();
server.on('stream', forward);
server.on('sessionError', () => {});
server.listen(LISTEN_PORT, '127.0.0.1');
