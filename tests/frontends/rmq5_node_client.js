// A RocketMQ 5 application in JavaScript: npm's rocketmq-client-nodejs 1.0.8 (the official gRPC
// client) driven from the command line, one JSON line per event on stdout. Its own npm folder
// (`make clients`, $RMQ5_NODE_DIR); it knows nothing of dledger but one node's gRPC address.
//
//   node rmq5_node_client.js produce ENDPOINTS TOPIC SPEC TIMEOUT_S
//       SPEC: a JSON list of messages {body, tag, keys, props, group, delay_ms, txn}; txn is
//       "commit", "rollback" or "check" (left open: the transaction checker commits it when the
//       broker asks). Prints {i, msg_id} or {i, error} per message, {checked: body} per check;
//       ends once every "check" message was checked (or at TIMEOUT_S).
//   node rmq5_node_client.js simple ENDPOINTS TOPIC GROUP EXPECT TIMEOUT_S RECHECK_MS
//       A SimpleConsumer: receives (invisible 2 s) and acks until EXPECT messages; then, after
//       RECHECK_MS, receives once more and prints {again: n} (acked messages must not come back).
//   node rmq5_node_client.js push ENDPOINTS TOPIC GROUP EXPECT TIMEOUT_S
//       A PushConsumer: prints each message its listener gets, ends after EXPECT or TIMEOUT_S
//       ({done: n}).
//
// A message is printed as {body, tag, keys, props, group, msg_id, attempt, corrupted, delivery_ms}.
'use strict';

const path = require('path');
const dir = path.join(process.env.RMQ5_NODE_DIR || '.', 'node_modules', 'rocketmq-client-nodejs');
const { Producer, SimpleConsumer, PushConsumer, ConsumeResult } = require(dir);
const { TransactionResolution } = require(path.join(dir, 'proto', 'apache', 'rocketmq', 'v2', 'definition_pb.js'));

const say = (...a) => process.stderr.write(a.map(String).join(' ').slice(0, 2000) + '\n');
const logger = process.env.RMQ5_NODE_DEBUG ? { info: say, warn: say, debug() {}, error: say } : { info() {}, warn() {}, debug() {}, error: say };
const out = obj => process.stdout.write(JSON.stringify(obj) + '\n');

function view(m) {
  return {
    body: m.body.toString(), tag: m.tag || '', keys: m.keys, props: Object.fromEntries(m.properties),
    group: m.messageGroup || '', msg_id: m.messageId, attempt: m.deliveryAttempt,
    corrupted: Boolean(m.corrupted), delivery_ms: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : 0,
  };
}

function deadline(timeoutS) {
  let fire;
  const done = new Promise(resolve => { fire = resolve; });
  const timer = setTimeout(fire, timeoutS * 1000);
  return { done, finish: () => { clearTimeout(timer); fire(); } };
}

async function produce(endpoints, topic, spec, timeoutS) {
  const toCheck = new Set(spec.filter(s => s.txn === 'check').map(s => s.body));
  const end = deadline(timeoutS);
  const checker = {
    async check(m) {
      const body = m.body.toString();
      out({ checked: body });
      if (!toCheck.has(body)) return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED;
      toCheck.delete(body);
      if (toCheck.size === 0) setImmediate(end.finish);  // (after this answer went out)
      return TransactionResolution.COMMIT;
    },
  };
  const producer = new Producer({ endpoints, namespace: '', topics: [ topic ], logger, checker });
  await producer.startup();
  for (const [ i, s ] of spec.entries()) {
    const message = {
      topic, body: Buffer.from(s.body), tag: s.tag, keys: s.keys,
      properties: s.props ? new Map(Object.entries(s.props)) : undefined,
      messageGroup: s.group, delay: s.delay_ms,
    };
    try {
      if (s.txn) {
        const transaction = producer.beginTransaction();
        const r = await producer.send(message, transaction);
        if (s.txn === 'commit') await transaction.commit();
        if (s.txn === 'rollback') await transaction.rollback();
        out({ i, msg_id: r.messageId });
      } else {
        const r = await producer.send(message);
        out({ i, msg_id: r.messageId });
      }
    } catch (err) {
      out({ i, error: String(err && err.message || err).slice(0, 500) });
    }
  }
  if (toCheck.size > 0) await end.done;
  await producer.shutdown();
}

async function simple(endpoints, topic, group, expect, timeoutS, recheckMs) {
  const consumer = new SimpleConsumer({
    endpoints, namespace: '', consumerGroup: group, logger, awaitDuration: 2000,
    subscriptions: new Map([[ topic, '*' ]]),
  });
  await consumer.startup();
  const until = Date.now() + timeoutS * 1000;
  let got = 0;
  while (got < expect && Date.now() < until) {
    for (const m of await consumer.receive(16, 2000)) {
      got += 1;
      await consumer.ack(m);
      out(view(m));
    }
  }
  await new Promise(resolve => setTimeout(resolve, recheckMs));  // (the window of the check)
  out({ again: (await consumer.receive(16, 2000)).length });
  await consumer.shutdown();
}

async function push(endpoints, topic, group, expect, timeoutS) {
  const end = deadline(timeoutS);
  let got = 0;
  const consumer = new PushConsumer({
    endpoints, namespace: '', consumerGroup: group, logger, longPollingTimeout: 2000,
    subscriptions: new Map([[ topic, '*' ]]),
    messageListener: {
      consume(m) {
        out(view(m));
        got += 1;
        if (got >= expect) end.finish();
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  out({ started: true });
  await end.done;
  out({ done: got });
  // (no shutdown: it waits out the long poll in flight, 30 s; the process just ends)
}

const [ role, endpoints, topic, ...rest ] = process.argv.slice(2);
const runs = {
  produce: () => produce(endpoints, topic, JSON.parse(rest[0]), Number(rest[1])),
  simple: () => simple(endpoints, topic, rest[0], Number(rest[1]), Number(rest[2]), Number(rest[3])),
  push: () => push(endpoints, topic, rest[0], Number(rest[1]), Number(rest[2])),
};
runs[role]().then(() => process.exit(0), err => { say(String(err && err.stack || err)); process.exit(1); });
