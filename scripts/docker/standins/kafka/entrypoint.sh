#!/bin/sh
# server.properties from KAFKA_* variables (as the official image does: KAFKA_ADVERTISED_LISTENERS ->
# advertised.listeners, a double underscore -> '-'), over a single-node KRaft default. KAFKA_HEAP_OPTS
# and KAFKA_OPTS (a JAAS file, say) go to the JVM, as kafka-server-start.sh passes them.
set -eu
PROPS=/var/lib/kafka/server.properties
DATA=/var/lib/kafka/data
env | grep '^KAFKA_' | grep -v -e '^KAFKA_HEAP_OPTS=' -e '^KAFKA_OPTS=' | while IFS='=' read -r name value; do
  key=$(echo "${name#KAFKA_}" | tr 'A-Z' 'a-z' | sed -e 's/__/-/g' -e 's/_/./g')
  echo "$key=$value"
done > "$PROPS"
# the defaults of a single-node KRaft broker, for every key the variables did not set
for default in "node.id=1" "process.roles=broker,controller" "listeners=PLAINTEXT://:9092,CONTROLLER://:9093" \
    "advertised.listeners=PLAINTEXT://localhost:9092" "controller.listener.names=CONTROLLER" \
    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT" \
    "offsets.topic.replication.factor=1" "transaction.state.log.replication.factor=1" \
    "transaction.state.log.min.isr=1" "log.dirs=$DATA"; do
  grep -q "^${default%%=*}=" "$PROPS" || echo "$default" >> "$PROPS"
done
STANDALONE=""
if ! grep -q '^controller.quorum.voters=' "$PROPS"; then
  grep -q '^controller.quorum.bootstrap.servers=' "$PROPS" \
    || echo "controller.quorum.bootstrap.servers=localhost:9093" >> "$PROPS"
  STANDALONE="--standalone"
fi
HEAP=${KAFKA_HEAP_OPTS:--Xmx512m}
if [ ! -f "$DATA/meta.properties" ]; then
  java $HEAP -cp '/opt/kafka/libs/*' kafka.tools.StorageTool format $STANDALONE \
    -t "${CLUSTER_ID:-R8m3nKafkaStandIn0001w}" -c "$PROPS" >/dev/null
fi
exec java $HEAP ${KAFKA_OPTS:-} -cp '/opt/kafka/libs/*' kafka.Kafka "$PROPS"
