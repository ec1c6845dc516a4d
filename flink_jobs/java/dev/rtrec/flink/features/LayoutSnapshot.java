package dev.rtrec.flink.features;

import java.io.IOException;
import java.util.function.Supplier;

import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSchemaCompatibility;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;

/**
 * A {@link CompactSerializer}'s snapshot: the layout version its values were written in. A checkpoint
 * of another layout is refused (Flink then raises its StateMigrationException, which `features run`
 * reports with what to do) instead of read as this one.
 */
abstract class LayoutSnapshot<T> implements TypeSerializerSnapshot<T> {
  private final Supplier<CompactSerializer<T>> serializer;
  private final int currentLayout;
  private int layout;

  LayoutSnapshot(Supplier<CompactSerializer<T>> serializer, int currentLayout) {
    this.serializer = serializer;
    this.currentLayout = currentLayout;
    this.layout = currentLayout;
  }

  @Override
  public int getCurrentVersion() {
    return 1;
  }

  @Override
  public void writeSnapshot(DataOutputView out) throws IOException {
    out.writeInt(layout);
  }

  @Override
  public void readSnapshot(int readVersion, DataInputView in, ClassLoader userCodeClassLoader) throws IOException {
    layout = in.readInt();
  }

  @Override
  public TypeSerializer<T> restoreSerializer() {
    return serializer.get();
  }

  @Override
  public TypeSerializerSchemaCompatibility<T> resolveSchemaCompatibility(TypeSerializerSnapshot<T> old) {
    if (old.getClass() == getClass() && ((LayoutSnapshot<?>) old).layout == currentLayout) {
      return TypeSerializerSchemaCompatibility.compatibleAsIs();
    }
    return TypeSerializerSchemaCompatibility.incompatible();
  }
}
