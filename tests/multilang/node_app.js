// A record processor for the Node.js KCL (npm package aws-kcl), run per shard by `shardherd multilang`.
// Each batch goes to the ledger file named by SHARDHERD_TEST_LEDGER in tests/support/file_ledger.py's line format,
// then it checkpoints at the batch's last sequence number; shutdownRequested and shardEnded checkpoint too.
'use strict';

const fs = require('fs');
const kcl = require('aws-kcl');

const ledger = process.env.SHARDHERD_TEST_LEDGER;
const worker = process.env.SHARDHERD_WORKER_ID || 'node';

function recordProcessor() {
  let shardId = '?';
  return {
    initialize: function(input, done) {
      shardId = input.shardId;
      fs.appendFileSync(ledger + '.notes', shardId + ' initialize ' + input.sequenceNumber + ' node\n');
      done();
    },
    processRecords: function(input, done) {
      const records = input.records;
      if (!records || records.length === 0) {
        done();
        return;
      }
      const now = (Date.now() / 1000).toFixed(3);
      const lines = records.map(function(r) {
        const data = Buffer.from(r.data, 'base64').toString();
        return shardId + ' ' + r.sequenceNumber + ' ' + (r.subSequenceNumber || 0) + ' ' + worker + ' ' + now +
          ' ' + data + '\n';
      });
      fs.appendFileSync(ledger, lines.join(''));
      input.checkpointer.checkpoint(records[records.length - 1].sequenceNumber, function(err) {
        if (err) {
          process.stderr.write('checkpoint failed: ' + err + '\n');
        }
        done();
      });
    },
    leaseLost: function(input, done) {
      done();
    },
    shardEnded: function(input, done) {
      input.checkpointer.checkpoint(function() { done(); });
    },
    shutdownRequested: function(input, done) {
      fs.appendFileSync(ledger + '.notes', shardId + ' shutdownRequested node\n');
      input.checkpointer.checkpoint(function() { done(); });
    }
  };
}

kcl(recordProcessor()).run();
