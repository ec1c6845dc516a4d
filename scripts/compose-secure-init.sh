#!/usr/bin/env bash
# What the secured compose stack (docker-compose.secure.yml) reads, made once with openssl, into
# ${RTREC_SECURE_DIR:-.compose-data/secure}:
#   ca.pem, server.pem/server.key and server-keystore.pem (key and chain, Kafka's PEM keystore): a CA of
#     its own and a server certificate for kafka, redis, localhost and 127.0.0.1;
#   kafka-admin.password, kafka-user.password, redis-user.password: random, one a file;
#   kafka.jaas: the broker's PLAIN users (admin, rtrec); redis.acl: the default user off, `rtrec`
#     confined to rtrec:* keys (its password as a SHA-256 only), `health` allowed PING and nothing else.
# The directory is mode 700 and is the lock: the containers run as other users and read the files
# through bind mounts (compose secrets), so the files themselves are 644 (the CA key stays 600).
# Files that exist are kept, so running it again changes nothing; delete the directory to start over.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${RTREC_SECURE_DIR:-$ROOT/.compose-data/secure}
command -v openssl >/dev/null || { echo "openssl is needed (Debian: apt-get install openssl)" >&2; exit 1; }
mkdir -p "$DIR"
chmod 700 "$DIR"
cd "$DIR"
umask 022
for who in kafka-admin kafka-user redis-user; do
  [ -s "$who.password" ] || openssl rand -hex 24 > "$who.password"
done
if [ ! -s server-keystore.pem ]; then
  quiet() { "$@" 2>/dev/null || { echo "failed: $*" >&2; exit 1; }; }
  quiet openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj /CN=rtrec-compose-ca -keyout ca.key -out ca.pem
  echo "subjectAltName=DNS:kafka,DNS:redis,DNS:localhost,IP:127.0.0.1" > san.ext
  quiet openssl req -newkey rsa:2048 -nodes -subj /CN=rtrec-compose -keyout server.key -out server.csr
  quiet openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 -out server.pem \
    -extfile san.ext
  cat server.key server.pem > server-keystore.pem
  rm -f server.csr san.ext ca.srl
  chmod 600 ca.key
  chmod 644 server.key server-keystore.pem
fi
cat > kafka.jaas <<EOF
KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
  username="admin" password="$(cat kafka-admin.password)"
  user_admin="$(cat kafka-admin.password)" user_rtrec="$(cat kafka-user.password)";
};
EOF
{
  echo "user default off"
  echo "user health on nopass -@all +ping"
  echo "user rtrec on #$(tr -d '\n' < redis-user.password | sha256sum | cut -d' ' -f1) ~rtrec:* &* +@all -@admin -@dangerous +info +scan"
} > redis.acl
echo "secured compose files in $DIR"
