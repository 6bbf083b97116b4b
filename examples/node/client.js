#!/usr/bin/env node
// Streams (or, with --unary, fetches) one completion from Switchyard.
//
// Stubs are loaded from ../../proto at start-up with @grpc/proto-loader, so
// the client always matches the checked-out contract. Exits 1 on a gRPC
// error, printing the status code, message and the google.rpc.ErrorInfo
// decoded from the status details to stderr.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');
const googleProtos = require('google-proto-files');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const PROTO_FILE = 'switchyard/v1/switchyard.proto';

function parseArgs(argv) {
  const args = {
    target: '127.0.0.1:50051',
    route: 'chat',
    prompt: 'Say hello.',
    maxTokens: 0,
    timeout: 60,
    unary: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${flag} needs a value`);
      return argv[++i];
    };
    switch (flag) {
      case '--target': args.target = value(); break;
      case '--route': args.route = value(); break;
      case '--prompt': args.prompt = value(); break;
      case '--max-tokens': args.maxTokens = Number(value()); break;
      case '--timeout': args.timeout = Number(value()); break;
      case '--unary': args.unary = true; break;
      case '--help': usage(); break;
      default: usage(`unknown argument ${flag}`);
    }
  }
  return args;
}

function usage(problem) {
  const text = 'usage: client.js [--target HOST:PORT] [--route R] [--prompt P] ' +
    '[--max-tokens N] [--timeout SECONDS] [--unary]';
  if (problem) {
    console.error(`error: ${problem}\n${text}`);
    process.exit(2);
  }
  console.log(text);
  process.exit(0);
}

function loadRouter() {
  const definition = protoLoader.loadSync(PROTO_FILE, {
    includeDirs: [PROTO_ROOT],
    // Field names as the proto spells them (served_by, finish_reason).
    keepCase: true,
    // Enum values as their names (TIER_PRIMARY), 64-bit integers as strings.
    enums: String,
    longs: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).switchyard.v1;
}

// google.rpc.Status and ErrorInfo, from Google's published protos.
function loadStatusTypes() {
  const root = new protobuf.Root();
  const dir = googleProtos.getProtoPath('..');
  root.resolvePath = (_origin, target) => path.join(dir, target);
  root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
  return {
    Status: root.lookupType('google.rpc.Status'),
    ErrorInfo: root.lookupType('google.rpc.ErrorInfo'),
  };
}

function summary(r) {
  const usage = r.usage || {};
  return `served_by=${r.served_by.provider}/${r.served_by.model}` +
    ` tier=${r.tier}` +
    ` finish=${r.finish_reason}` +
    ` attempts=${r.attempts}` +
    ` usage=in:${usage.input_tokens},out:${usage.output_tokens}` +
    (usage.estimated ? ',estimated' : '') +
    ` request_id=${r.request_id}`;
}

// The ErrorInfo in a failed call's `grpc-status-details-bin` trailer, if any.
function errorInfo(err, types) {
  const raw = err.metadata && err.metadata.get('grpc-status-details-bin');
  if (!raw || raw.length === 0) return null;
  const status = types.Status.decode(raw[0]);
  for (const any of status.details) {
    if (any.type_url.endsWith('/google.rpc.ErrorInfo')) {
      return types.ErrorInfo.decode(any.value);
    }
  }
  return null;
}

function report(err, types) {
  const code = grpc.status[err.code] || String(err.code);
  let line = `error: ${code}: ${err.details}`;
  const info = errorInfo(err, types);
  if (info) {
    line += ` (reason=${info.reason}`;
    for (const key of Object.keys(info.metadata).sort()) {
      line += ` ${key}=${info.metadata[key]}`;
    }
    line += ')';
  }
  console.error(line);
}

function stream(client, request, deadline) {
  return new Promise((resolve, reject) => {
    const call = client.StreamCompletion(request, { deadline });
    call.on('data', (event) => {
      switch (event.event) {
        case 'delta':
          process.stdout.write(event.delta.text);
          break;
        case 'reset':
          // The attempt failed after output: discard it, a new answer follows.
          process.stdout.write(`\n[reset: ${event.reset.reason}]\n`);
          break;
        case 'finished':
          process.stdout.write('\n' + summary(event.finished) + '\n');
          break;
        default:
          break;
      }
    });
    call.on('error', reject);
    call.on('end', resolve);
  });
}

function unary(client, request, deadline) {
  return new Promise((resolve, reject) => {
    client.Complete(request, { deadline }, (err, r) => {
      if (err) return reject(err);
      process.stdout.write(r.text + '\n' + summary(r) + '\n');
      return resolve();
    });
  });
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const v1 = loadRouter();
  const types = loadStatusTypes();
  const client = new v1.Router(args.target, grpc.credentials.createInsecure());
  const request = {
    route: args.route,
    messages: [{ role: 'user', content: args.prompt }],
    max_tokens: args.maxTokens,
  };
  const deadline = new Date(Date.now() + args.timeout * 1000);
  try {
    await (args.unary ? unary : stream)(client, request, deadline);
    return 0;
  } catch (err) {
    if (err.code === undefined) throw err;
    report(err, types);
    return 1;
  } finally {
    client.close();
  }
}

main().then((code) => { process.exitCode = code; }, (err) => {
  console.error(`error: ${err.stack || err}`);
  process.exitCode = 2;
});
