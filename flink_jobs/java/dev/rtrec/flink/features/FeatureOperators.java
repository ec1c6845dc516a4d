package dev.rtrec.flink.features;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.streaming.api.datastream.SingleOutputStreamOperator;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.runtime.typeutils.InternalTypeInfo;
import org.apache.flink.table.types.logical.RowType;
import org.apache.flink.table.types.logical.utils.LogicalTypeParser;
import org.apache.flink.util.OutputTag;

/**
 * The feature job's windows and samples as two keyed operators, between the SQL that reads and
 * checks the events and the SQL that writes the topics: {@link ItemStage} keyed by item, then
 * {@link UserStage} keyed by user. Each event is counted once per tile length in plain Java state,
 * where the SQL plan ran seven window aggregations, three interval joins, an OVER aggregate, a
 * temporal join and a window over the union of their rows, with a second source for the samples.
 */
public final class FeatureOperators {
  private FeatureOperators() {}

  static RowType rowType(String type) {
    return (RowType) LogicalTypeParser.parse(type, FeatureOperators.class.getClassLoader());
  }

  /** Keys the checked events by item. */
  public static final class ByItem implements KeySelector<StagedEvent, String> {
    private static final long serialVersionUID = 1L;

    @Override
    public String getKey(StagedEvent e) {
      return e.itemId;
    }
  }

  /** Keys the staged events by user. */
  public static final class ByUser implements KeySelector<StagedEvent, String> {
    private static final long serialVersionUID = 1L;

    @Override
    public String getKey(StagedEvent e) {
      return e.userId;
    }
  }

  /** The dead letters' columns, as {@link CheckedSplit} writes them. */
  static final String DEAD_LETTER_TYPE =
      "ROW<reason STRING, source_topic STRING, `value` BYTES, `partition` INT, `offset` BIGINT>";

  /**
   * Reads the table {@code source} (the events topic {@code topic}: value, headers, partition, offset,
   * the rowtime's watermark) once, decodes each record with the decode UDF's arguments (writer schemas,
   * reader schema, limits: flink_jobs/feature_job.decode_args), and registers the views
   * {@code recordsView} (FeatureRecords) and {@code samplesView} (TrainingSamples or TrainingSampleBlocks,
   * when the spec writes samples), both as {@link Records#ROW_TYPE}, and {@code deadLettersView}
   * ({@link #DEAD_LETTER_TYPE}). The schemas come as their JSON with their header values. Samples go
   * {@code samplesPerMessage} to a message ({@link SampleBlocks}), a block at least every
   * {@code samplesFlushMs} when that is above 0 (else at each checkpoint).
   */
  public static void register(StreamTableEnvironment tEnv, String source, String topic, String writerSchemas,
      String readerSchema, Long maxPastMs, Long maxFutureMs, Long minTimeMs, Long maxValueBytes, Long maxIdLength,
      String spec,
      String recordSchema, String recordHeader, String sampleSchema, String sampleHeader, String blockSchema,
      String blockHeader, int samplesPerMessage, long samplesFlushMs, int pairHorizonS,
      int listHorizonS, String featureEntities, String recordsView, String samplesView, String deadLettersView) {
    FeatureSpec s = FeatureSpec.parse(spec);
    Records records = new Records(recordSchema, recordHeader, sampleSchema, sampleHeader, blockSchema, blockHeader);
    InternalTypeInfo<RowData> recordInfo = InternalTypeInfo.of(rowType(Records.ROW_TYPE));
    OutputTag<RowData> itemRecords = new OutputTag<>("item-records", recordInfo);
    OutputTag<SampleRow> samples = new OutputTag<>("samples", TypeInformation.of(SampleRow.class));
    InternalTypeInfo<RowData> deadInfo = InternalTypeInfo.of(rowType(DEAD_LETTER_TYPE));
    OutputTag<RowData> deadLetters = new OutputTag<>("dead-letters", deadInfo);
    Long[] limits = {maxPastMs, maxFutureMs, minTimeMs, maxValueBytes, maxIdLength};
    SingleOutputStreamOperator<StagedEvent> events = tEnv.toDataStream(tEnv.sqlQuery(
            "SELECT `value`, `headers`, `partition`, `offset` FROM " + source))
        .process(new CheckedSplit(s, topic, deadLetters, writerSchemas, readerSchema, limits),
            TypeInformation.of(StagedEvent.class))
        .name("checked");
    tEnv.createTemporaryView(deadLettersView, tEnv.fromDataStream(events.getSideOutput(deadLetters)));
    SingleOutputStreamOperator<StagedEvent> byItem = events
        .keyBy(new ByItem())
        .process(new ItemStage(s, records, itemRecords), TypeInformation.of(StagedEvent.class))
        .uid("rtrec-feature-items-" + s.geometryHash()).name("items");
    SingleOutputStreamOperator<RowData> byUser = byItem
        .keyBy(new ByUser())
        .process(new UserStage(s, records, samples, pairHorizonS, listHorizonS, featureEntities.split(",")), recordInfo)
        .uid("rtrec-feature-users-" + s.geometryHash()).name("users");
    tEnv.createTemporaryView(recordsView, tEnv.fromDataStream(byUser.union(byItem.getSideOutput(itemRecords))));
    if (s.samples) {
      tEnv.createTemporaryView(samplesView, tEnv.fromDataStream(byUser.getSideOutput(samples)
          .transform("samples", recordInfo, new SampleBlocks(records, samplesPerMessage, samplesFlushMs))));
    }
  }
}
