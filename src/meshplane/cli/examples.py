"""How each command is used: the lines that end its ``--help``."""

EXAMPLES = {
    "up": [
        "meshplane up",
        "meshplane up --no-pipeline --duration 60",
        "meshplane up --transport zmq --brokers 2",
    ],
    "pub": [
        "meshplane pub dynamo/worker/generate kv-events hello",
        "meshplane pub dynamo/worker/generate kv-events '{\"stored\": [1]}' --json --count 10 --rate 5",
        "seq 100 | meshplane pub dynamo/worker/generate kv-events --wait-subscribers 1",
    ],
    "sub": [
        "meshplane sub dynamo/worker/generate kv-events",
        "meshplane sub dynamo/worker kv-events --json --count 10   (every endpoint of the component)",
        "meshplane sub dynamo/worker/generate kv-events --timeout 5",
    ],
    "ls": ["meshplane ls", "meshplane ls dynamo/worker --json"],
    "broker": ["meshplane broker --xsub tcp://127.0.0.1:5555 --xpub tcp://127.0.0.1:5556"],
    "broker-stats": ["meshplane broker-stats tcp://127.0.0.1:5557"],
    "shell": ["meshplane shell", "meshplane shell --shell /bin/bash"],
    "tls": [
        "meshplane tls ca --dir certs",
        "meshplane tls node a --cluster east --dir certs --host 10.0.0.5",
        "meshplane tls client billing --dir certs",
        "meshplane tls show certs/a.pem",
    ],
    "serve": [
        "meshplane serve",
        "meshplane serve --port 15500 --data-dir /var/lib/meshplane --fsync always",
        "meshplane serve --port 15501 --data-dir a --node-id a --cluster c1 --route-port 16501 "
        "--routes tcp://127.0.0.1:16502,tcp://127.0.0.1:16503",
    ],
    "mesh": [
        "meshplane mesh status --url http://127.0.0.1:15501",
        "meshplane mesh queue-add orders 'orders.>' --url http://127.0.0.1:15502",
    ],
    "vpn": [
        "meshplane vpn check vpns.toml",
        "meshplane vpn ls --url http://127.0.0.1:15501",
        "meshplane vpn show team-a --url http://127.0.0.1:15501",
        "meshplane vpn reload --url http://127.0.0.1:15501",
    ],
    "log": [
        "meshplane log verify --data-dir .meshplane/streams",
        "meshplane log dump .meshplane/streams/topics/t/0",
    ],
    "pipeline": [
        "meshplane pipeline demo",
        "meshplane pipeline demo --url http://127.0.0.1:15500 --follow 60",
    ],
    "config": [
        "meshplane config check serve.toml",
        "meshplane config show serve.toml --port 16000",
        "meshplane serve --config serve.toml",
    ],
    "context": [
        "meshplane context ls",
        "meshplane context save prod --select",
        "meshplane context select none",
    ],
    "env": ['eval "$(meshplane env)"'],
    "status": ["meshplane status", "meshplane status --json"],
    "completion": ['eval "$(meshplane completion bash)"'],
    "bench": [
        "meshplane bench --list",
        "meshplane bench event_plane mesh",
        "meshplane bench streams --args '--events 20000'",
    ],
}
