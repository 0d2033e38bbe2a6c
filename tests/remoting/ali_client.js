// A RocketMQ 4.x application in JavaScript: npm's ali-ons 3.12.0 (pure JavaScript, the remoting
// protocol) driven from the command line, one JSON line per event on stdout. Its own npm folder
// (`make clients`); it knows nothing of dledger but the NameServer's address.
//
//   node ali_client.js produce NAMESRV TOPIC COUNT       messages with the user property a = i
//   node ali_client.js consume NAMESRV TOPIC GROUP SQL EXPECT TIMEOUT_S [FAIL_BODY] [MAX_RECONSUME]
//
// `consume` subscribes with the SQL92 expression SQL, prints each delivery, fails the message whose
// body is FAIL_BODY (every time: it goes to %RETRY% and then %DLQ%), and
// ends after EXPECT successful deliveries (with a FAIL_BODY: when stopped) or TIMEOUT_S.
'use strict';

const path = require('path');
const { Producer, Consumer, Message } = require(path.join(process.env.ALI_ONS_DIR || '.', 'node_modules', 'ali-ons'));

const httpclient = { request: async () => { throw new Error('no HTTP address lookup here'); } };
const say = (...a) => process.stderr.write(a.map(String).join(' ') + '\n');
const quiet = process.env.ALI_DEBUG ? { info: say, warn: say, debug() {}, error: say } : { info() {}, warn() {}, debug() {}, error: say };
const out = obj => process.stdout.write(JSON.stringify(obj) + '\n');

async function produce(nameSrv, topic, count) {
  const producer = new Producer({ httpclient, nameSrv, producerGroup: 'ali-producer', logger: quiet });
  await producer.ready();
  for (let i = 0; i < count; i++) {
    const msg = new Message(topic, 'TagA', `ali ${i}`);
    msg.keys = [`ali-${i}`];
    msg.properties.a = String(i);
    try {
      const r = await producer.send(msg);
      out({ i, status: r.sendStatus, msg_id: r.msgId });
    } catch (err) {
      out({ i, error: String(err && err.message || err).slice(0, 500) });
    }
  }
  await producer.close();
}

async function consume(nameSrv, topic, group, sql, expect, timeoutS, failBody, maxReconsume) {
  const consumer = new Consumer({
    httpclient, nameSrv, consumerGroup: group, logger: quiet, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    maxReconsumeTimes: maxReconsume, rebalanceInterval: 2000,
  });
  let ok = 0;
  let finish;
  const done = new Promise(resolve => { finish = resolve; });
  const timer = setTimeout(finish, timeoutS * 1000);
  consumer.on('error', err => {
    if (!String(err && err.message).includes('on purpose')) process.stderr.write(`consumer error: ${err && err.message}\n`);
  });
  consumer.subscribe(topic, { expressionType: 'SQL92', subString: sql }, async msg => {
    const body = msg.body.toString();
    const failed = body === failBody;
    out({ topic: msg.topic, body, tags: msg.tags, keys: msg.keys, a: msg.properties.a, reconsume: msg.reconsumeTimes, failed });
    // (throw, not ACTION_RETRY: ali-ons' handler of its retry topic drops the return value)
    if (failed) throw new Error(`failing ${body} on purpose`);
    ok += 1;
    if (ok >= expect && !failBody) finish();
  });
  await consumer.ready();
  out({ started: true });
  await done;
  clearTimeout(timer);
  await consumer.close();
  out({ done: ok });
}

const [role, nameSrv, topic, ...rest] = process.argv.slice(2);
const run = role === 'produce'
  ? produce(nameSrv, topic, Number(rest[0]))
  : consume(nameSrv, topic, rest[0], rest[1], Number(rest[2]), Number(rest[3]), rest[4] || '', Number(rest[5] || 16));
run.then(() => process.exit(0), err => { process.stderr.write(String(err && err.stack || err) + '\n'); process.exit(1); });
