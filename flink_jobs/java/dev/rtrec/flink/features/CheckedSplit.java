package dev.rtrec.flink.features;

import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.Map;

import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

import dev.rtrec.flink.DecodeInteractionEvent;

/**
 * Beside the source, each record of the events topic (bytes, headers, partition, offset) is decoded and
 * checked ({@link DecodeInteractionEvent}, whose last decode in this thread, the source's for its
 * watermark, is reused): one that did not decode, or whose base window had closed at the watermark
 * (late), goes to the dead letters with its reason; the rest go on to the operators as
 * {@link StagedEvent}s. Every window in the operators closes on this same watermark, so nothing that
 * passes here is late there.
 */
final class CheckedSplit extends ProcessFunction<Row, StagedEvent> {
  private static final long serialVersionUID = 1L;
  private static final DateTimeFormatter WATERMARK =
      DateTimeFormatter.ofPattern("yyyy-MM-dd HH:mm:ss.SSS").withZone(ZoneOffset.UTC);

  // the decode UDF's row: DecodeInteractionEvent's output type
  private static final int EVENT_ID = 0;
  private static final int USER_ID = 1;
  private static final int ITEM_ID = 2;
  private static final int EVENT_TYPE = 3;
  private static final int EVENT_TIME_MS = 4;
  private static final int DWELL_MS = 5;
  private static final int POSITION = 6;
  private static final int ERROR = 8;

  private final FeatureSpec spec;
  private final String topic;
  private final OutputTag<RowData> deadLetters;
  private final String writerSchemas;
  private final String readerSchema;
  private final Long[] limits;
  private transient DecodeInteractionEvent decoder;

  /** {@code decodeArgs}: the decode UDF's arguments after the value and headers (the job's decode_args). */
  CheckedSplit(FeatureSpec spec, String topic, OutputTag<RowData> deadLetters, String writerSchemas,
      String readerSchema, Long[] limits) {
    this.spec = spec;
    this.topic = topic;
    this.deadLetters = deadLetters;
    this.writerSchemas = writerSchemas;
    this.readerSchema = readerSchema;
    this.limits = limits;
  }

  @Override
  @SuppressWarnings("unchecked")
  public void processElement(Row row, Context ctx, Collector<StagedEvent> out) {
    if (decoder == null) {
      decoder = new DecodeInteractionEvent();
    }
    Row ev = decoder.eval((byte[]) row.getField(0), (Map<String, byte[]>) row.getField(1), writerSchemas,
        readerSchema, limits[0], limits[1], limits[2], limits[3], limits[4]);
    String reason = (String) ev.getField(ERROR);
    if (reason == null) {
      long timeMs = (Long) ev.getField(EVENT_TIME_MS);
      long watermark = ctx.timerService().currentWatermark();
      if (!spec.late(timeMs, watermark)) {
        Long dwell = (Long) ev.getField(DWELL_MS);
        Integer position = (Integer) ev.getField(POSITION);
        out.collect(new StagedEvent((String) ev.getField(EVENT_ID), (String) ev.getField(USER_ID),
            (String) ev.getField(ITEM_ID), Tile.typeCode((String) ev.getField(EVENT_TYPE)), timeMs,
            dwell == null ? -1 : dwell, position == null ? -1 : position));
        return;
      }
      reason = "late: event_time " + timeMs + " is behind the watermark "
          + WATERMARK.format(Instant.ofEpochMilli(watermark));
    }
    ctx.output(deadLetters, GenericRowData.of(StringData.fromString(reason), StringData.fromString(topic),
        row.getField(0), row.getField(2), row.getField(3)));
  }
}
